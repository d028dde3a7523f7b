//! dcgm-exporter's names (`[sinks.dcgm]`) through the real `junction` on the simulated H100
//! node, checked against dcgm-exporter's own rules (`../shared/realworld/dcgm-consumers/
//! dcgm-exporter/LABELS-AND-UNITS.md`): the default counter set, line by line, with exactly
//! its labels in its order for a bare-metal node, a Kubernetes node (pod-resources) and a
//! Slurm node (a job-mapping directory), values in its units equal to Junction's own
//! readings; a counters file in its CSV format selects the fields; and NVIDIA's Grafana
//! dashboard's every query returns data from a real Prometheus scraping the listener.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::kubelet::{Kubelet, pod};
use crate::support::{self, Agent, parse, value};

mod dashboard;

const MIB: f64 = 1024.0 * 1024.0;

fn shared(name: &str) -> std::path::PathBuf {
    testkit::shared()
        .join("realworld/dcgm-consumers/dcgm-exporter")
        .join(name)
}

/// One line of the page: name, labels in their order, value as printed.
#[derive(Debug)]
struct Line {
    name: String,
    labels: Vec<(String, String)>,
    value: String,
}

fn lines(page: &str) -> Vec<Line> {
    page.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (head, value) = l.rsplit_once(' ').expect("a value");
            let (name, labels) = head.split_once('{').expect("labels");
            let labels = labels.trim_end_matches('}');
            let mut out = Vec::new();
            let mut rest = labels;
            while !rest.is_empty() {
                let (k, r) = rest.split_once("=\"").expect("a label");
                let end = r.find('"').expect("a closing quote");
                out.push((k.to_string(), r[..end].to_string()));
                rest = r[end + 1..].trim_start_matches(',');
            }
            Line {
                name: name.to_string(),
                labels: out,
                value: value.to_string(),
            }
        })
        .collect()
}

fn compat_config(port: u16, dcgm: u16, extra: &str) -> String {
    support::sim_config("current", port, "")
        + &format!(
            "\n[sinks.dcgm]\nenabled = true\nlisten = \"127.0.0.1:{dcgm}\"\nhostname = \"gpu-node-7\"\n{extra}\n"
        )
}

/// The fields of the default CSV (names only: the file is dcgm-exporter's).
fn default_fields() -> Vec<String> {
    std::fs::read_to_string(shared("etc_default-counters.csv"))
        .expect("default-counters.csv")
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && l.contains(','))
        .map(|l| l.split(',').next().unwrap_or("").trim().to_string())
        .collect()
}

/// Checks every line's label keys against dcgm-exporter's order: `gpu, UUID, pci_bus_id,
/// device, modelName, Hostname, DCGM_FI_DRIVER_VERSION`, then the attributes sorted.
fn check_labels(page: &str, attrs: &[&str]) {
    for l in lines(page) {
        let keys: Vec<&str> = l.labels.iter().map(|(k, _)| k.as_str()).collect();
        let mut want = vec![
            "gpu",
            "UUID",
            "pci_bus_id",
            "device",
            "modelName",
            "Hostname",
            "DCGM_FI_DRIVER_VERSION",
        ];
        let mut tail: Vec<&str> = attrs.to_vec();
        if l.name == "DCGM_FI_DEV_XID_ERRORS" {
            tail.extend(["err_code", "err_msg"]);
        }
        tail.sort_unstable();
        want.extend(tail);
        assert_eq!(keys, want, "{l:?}");
        let gpu = &l.labels[0].1;
        assert_eq!(l.labels[3].1, format!("nvidia{gpu}"));
        assert_eq!(l.labels[5].1, "gpu-node-7");
        assert!(
            l.labels[2].1.len() == 16 && l.labels[2].1.starts_with("00000000:"),
            "{l:?}"
        );
    }
}

#[test]
fn the_default_set_with_dcgm_exporters_labels_units_and_values() {
    let (port, dcgm) = (support::free_port(), support::free_port());
    let mut agent = Agent::spawn_config("h100-training.toml", &compat_config(port, dcgm, ""));
    let native = agent.wait_for(Duration::from_secs(30), |m| {
        m.contains("gpu_sm_activity_ratio") && m.contains(support::NVML_UP)
    });
    let page = support::scrape(dcgm, Duration::from_secs(5)).expect("scrape :dcgm");
    check_labels(&page, &[]);
    let got = lines(&page);
    let served: std::collections::BTreeSet<&str> = got.iter().map(|l| l.name.as_str()).collect();
    for f in default_fields() {
        let expected = !matches!(
            f.as_str(),
            // No NVML reading (METRICS.md), and the label field.
            "DCGM_FI_DEV_VGPU_LICENSE_STATUS" | "DCGM_FI_DRIVER_VERSION"
        );
        assert_eq!(served.contains(f.as_str()), expected, "{f}");
    }
    // Counters keep their names (no _total); # TYPE is the CSV's.
    assert!(page.contains("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"));
    assert!(!page.contains("_total{"));
    // Values in dcgm-exporter's units, equal to Junction's own readings.
    let s = parse(&native);
    let uuids = support::uuids(&s);
    let at = |name: &str, gpu: usize| -> f64 {
        got.iter()
            .find(|l| l.name == name && l.labels[1].1 == uuids[gpu])
            .unwrap_or_else(|| panic!("{name} for GPU {gpu}"))
            .value
            .parse()
            .expect("a number")
    };
    let mine = |name: &str, gpu: usize, attrs: &[(&str, &str)]| -> f64 {
        let mut a = vec![("hw_id", uuids[gpu].as_str())];
        a.extend_from_slice(attrs);
        value(&s, name, &a).unwrap_or_else(|| panic!("{name}"))
    };
    assert_eq!(at("DCGM_FI_DEV_GPU_TEMP", 0), 64.0);
    assert_eq!(at("DCGM_FI_DEV_MEMORY_TEMP", 0), 71.0);
    assert_eq!(at("DCGM_FI_DEV_SM_CLOCK", 0), 1980.0, "MHz");
    assert_eq!(at("DCGM_FI_DEV_GPU_UTIL", 0), 97.0, "percent, an integer");
    assert_eq!(at("DCGM_FI_DEV_MEM_COPY_UTIL", 0), 48.0);
    assert_eq!(
        at("DCGM_FI_DEV_FB_USED", 0),
        (mine("hw_gpu_memory_usage_bytes", 0, &[]) / MIB).round(),
        "MiB"
    );
    assert_eq!(at("DCGM_FI_DEV_FB_RESERVED", 0), 509.0);
    assert_eq!(at("DCGM_FI_DEV_XID_ERRORS", 0), 0.0, "no XID yet");
    let tensor = at("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0);
    assert!((0.0..=1.0).contains(&tensor), "a ratio: {tensor}");
    // Six decimals for DCGM's DOUBLE fields, integers for INT64 ones.
    let power = got
        .iter()
        .find(|l| l.name == "DCGM_FI_DEV_POWER_USAGE")
        .expect("power");
    assert_eq!(
        power.value.split('.').nth(1).map(str::len),
        Some(6),
        "{power:?}"
    );
    let energy = got
        .iter()
        .find(|l| l.name == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
        .expect("energy");
    assert!(!energy.value.contains('.'), "mJ as an integer: {energy:?}");
    assert!(agent.terminate().success());
}

#[test]
fn a_slurm_node_and_a_kubernetes_node_carry_the_job_and_the_pod() {
    let dir = support::temp_dir();
    // Slurm prolog's mapping files: GPU 0 runs one job, GPU 1 two; the rest none.
    let jobs = dir.join("hpc-jobs");
    std::fs::create_dir_all(&jobs).expect("dir");
    std::fs::write(jobs.join("0"), "41187\n").expect("job");
    std::fs::write(jobs.join("1"), "41188\n41190\n").expect("jobs");
    let socket = dir.join("kubelet.sock");
    let pods = dir.join("pods");
    std::fs::create_dir_all(&pods).expect("pods");
    let kubelet = Kubelet::start(&socket);
    let (port, dcgm) = (support::free_port(), support::free_port());
    let cfg = compat_config(
        port,
        dcgm,
        &format!("hpc_job_mapping_dir = {:?}\n", jobs.display().to_string()),
    ) + &format!(
        "\n[sources.kubernetes]\npod_resources_socket = {:?}\npod_logs_dir = {:?}\ninterval_secs = 1\n",
        socket.display().to_string(),
        pods.display().to_string()
    );
    let mut agent = Agent::spawn_config("h100-training.toml", &cfg);
    let native = agent.wait_for(Duration::from_secs(30), |m| {
        m.contains("gpu_info{") && m.contains(support::NVML_UP)
    });
    let uuids = support::uuids(&parse(&native));
    kubelet.set_pods(vec![pod(
        "ml",
        "train-0",
        "worker",
        "nvidia.com/gpu",
        &[&uuids[5]],
    )]);
    agent.wait_for(Duration::from_secs(20), |m| {
        m.contains("gpu_k8s_allocation{")
    });
    let page = support::scrape(dcgm, Duration::from_secs(5)).expect("scrape");
    let by_gpu = |g: &str| -> Vec<Line> {
        lines(&page)
            .into_iter()
            .filter(|l| l.name == "DCGM_FI_DEV_GPU_TEMP" && l.labels[0].1 == g)
            .collect()
    };
    // GPU 0: one row with its job; GPU 1: a row per job; GPU 2: no job, no pod labels.
    let g0 = by_gpu("0");
    assert_eq!(g0.len(), 1);
    assert_eq!(
        g0[0].labels.last(),
        Some(&("hpc_job".into(), "41187".into()))
    );
    let g1: Vec<String> = by_gpu("1")
        .iter()
        .map(|l| l.labels.last().expect("labels").1.clone())
        .collect();
    assert_eq!(g1, vec!["41188", "41190"]);
    let g2 = by_gpu("2");
    assert_eq!(
        g2[0].labels.len(),
        7,
        "a GPU no pod holds has no pod labels: {g2:?}"
    );
    // GPU 5: the pod's labels, sorted among the attributes.
    let g5 = by_gpu("5");
    let tail: BTreeMap<&str, &str> = g5[0].labels[7..]
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        tail,
        BTreeMap::from([
            ("container", "worker"),
            ("namespace", "ml"),
            ("pod", "train-0")
        ])
    );
    check_labels(
        &lines(&page)
            .iter()
            .filter(|l| l.labels[0].1 == "5")
            .map(|l| {
                format!(
                    "{}{{{}}} {}",
                    l.name,
                    l.labels
                        .iter()
                        .map(|(k, v)| format!("{k}=\"{v}\""))
                        .collect::<Vec<_>>()
                        .join(","),
                    l.value
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
        &["container", "namespace", "pod"],
    );
    assert!(agent.terminate().success());
}

#[test]
fn a_counters_file_in_dcgm_exporters_format_selects_the_fields() {
    let dir = support::temp_dir();
    let csv = dir.join("counters.csv");
    std::fs::write(
        &csv,
        "# Format\n# If line starts with a '#' it is considered a comment\n# DCGM FIELD, Prometheus metric type, help message\n\nDCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\nDCGM_FI_DEV_FB_TOTAL, gauge, Total framebuffer (in MiB).\n",
    )
    .expect("csv");
    let (port, dcgm) = (support::free_port(), support::free_port());
    let cfg = compat_config(
        port,
        dcgm,
        &format!("counters = {:?}\n", csv.display().to_string()),
    );
    let mut agent = Agent::spawn_config("h100-training.toml", &cfg);
    agent.wait_for(Duration::from_secs(30), |m| {
        m.contains("gpu_info{") && m.contains(support::NVML_UP)
    });
    let page = support::scrape(dcgm, Duration::from_secs(5)).expect("scrape");
    let names: std::collections::BTreeSet<String> =
        lines(&page).into_iter().map(|l| l.name).collect();
    assert_eq!(
        names,
        ["DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_GPU_TEMP"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    assert!(
        page.contains("# HELP DCGM_FI_DEV_FB_TOTAL Total framebuffer (in MiB).\n"),
        "the CSV's help"
    );
    // No driver-version label: the file does not list it.
    assert!(!page.contains("DCGM_FI_DRIVER_VERSION="));
    assert!(agent.terminate().success());
    // A field Junction does not know is a configuration error naming the file and line.
    std::fs::write(
        &csv,
        "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_NOT_A_FIELD, gauge, x\n",
    )
    .expect("csv");
    let file = dir.join("junction.toml");
    std::fs::write(&file, &cfg).expect("config");
    let out = support::output(
        support::junction()
            .arg("--config")
            .arg(&file)
            .arg("validate"),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("sinks.dcgm.counters")
            && err.contains("line 2")
            && err.contains("DCGM_FI_DEV_NOT_A_FIELD"),
        "{err}"
    );
}

/// A Slurm step's cgroup as `slurmstepd` makes it, with a process in it: cgroup v1
/// (`/slurm/uid_0/job_<id>/…` in the freezer hierarchy) where that is mounted, else v2's
/// `system.slice/slurmstepd.scope/job_<id>/…`. Dropped, the process ends and the cgroups go.
struct SlurmStep {
    child: std::process::Child,
    dirs: Vec<std::path::PathBuf>,
}

impl SlurmStep {
    fn enter(job: u32, child: std::process::Child) -> SlurmStep {
        let v1 = std::path::Path::new("/sys/fs/cgroup/freezer");
        let (top, leaf) = if v1.join("cgroup.procs").exists() {
            let top = v1.join("slurm");
            (
                top.clone(),
                top.join(format!("uid_0/job_{job}/step_0/task_0")),
            )
        } else {
            let top = std::path::PathBuf::from("/sys/fs/cgroup/system.slice/slurmstepd.scope");
            (
                top.clone(),
                top.join(format!("job_{job}/step_0/user/task_0")),
            )
        };
        let dirs = leaf
            .ancestors()
            .take_while(|d| d.starts_with(&top))
            .map(|d| d.to_path_buf())
            .collect();
        std::fs::create_dir_all(&leaf).expect("the step's cgroup (as root)");
        let step = SlurmStep { child, dirs };
        std::fs::write(leaf.join("cgroup.procs"), step.child.id().to_string())
            .expect("join the step");
        step
    }
}

impl Drop for SlurmStep {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Leaf first; a directory something else still uses stays.
        for d in &self.dirs {
            let _ = std::fs::remove_dir(d);
        }
    }
}

#[test]
fn a_process_in_a_slurm_steps_cgroup_carries_its_job_id() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        eprintln!("skipped: making a cgroup needs root");
        return;
    }
    // A real process, put in a job's step the way slurmstepd does, is the one the simulated
    // GPU 0 reports; Junction reads its cgroup from the real /proc.
    let sleeper = std::process::Command::new("sleep")
        .arg("120")
        .spawn()
        .expect("sleep");
    let pid = sleeper.id();
    let job = 700_000 + std::process::id() % 100_000;
    let step = SlurmStep::enter(job, sleeper);
    let dir = support::temp_dir();
    let scenario = dir.join("slurm-node.toml");
    std::fs::write(
        &scenario,
        format!(
            "base = {:?}\ngpu_count = 2\n[defaults]\npid_stride = 0\nprocesses = [{{ pid = {pid}, name = \"sleep\", kind = \"compute\", used_mib = 2048, sm_util = 40, mem_util = 10 }}]\n",
            support::scenario("h100-training.toml").display().to_string()
        ),
    )
    .expect("scenario");
    let port = support::free_port();
    let cfg = support::sim_config("current", port, "").replace(
        &format!(
            "proc_root = {:?}",
            support::empty_proc().display().to_string()
        ),
        "proc_root = \"/proc\"",
    );
    let mut agent = Agent::spawn_config_path(&scenario, &cfg, &[]);
    let needle = format!("slurm_job_id=\"{job}\"");
    let page = agent.wait_for(Duration::from_secs(30), |m| {
        m.lines()
            .any(|l| l.starts_with("gpu_process_memory_usage_bytes{") && l.contains(&needle))
            && m.contains(support::NVML_UP)
    });
    let rows: Vec<&str> = page
        .lines()
        .filter(|l| l.starts_with("gpu_process_memory_usage_bytes{"))
        .collect();
    assert_eq!(rows.len(), 2, "one row per GPU: {rows:?}");
    for r in &rows {
        assert!(r.contains(&needle), "{r}");
        assert!(r.contains(&format!("process_pid=\"{pid}\"")), "{r}");
        assert!(!r.contains("container_id="), "no container: {r}");
        assert_eq!(value_of(r), 2048.0 * MIB);
    }
    assert!(agent.terminate().success());
    drop(step);
}

fn value_of(line: &str) -> f64 {
    line.rsplit_once(' ')
        .and_then(|(_, v)| v.parse().ok())
        .expect("a value")
}
