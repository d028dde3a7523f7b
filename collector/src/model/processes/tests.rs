//! The process table and cgroup shapes: who a pid is, and which paths are a container's or a pod's.

use super::*;

const ID: &str = "3f4e2a1b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f";
const UID: &str = "0b7a2c5e-9d41-4c8e-a2f3-6e1d5b9c8a70";

fn ids(path: &str) -> (Option<String>, Option<&'static str>, Option<String>) {
    let i = parse_cgroup_path(path);
    (i.container_id, i.runtime, i.pod_uid)
}

#[test]
fn docker() {
    // cgroupfs driver (v1 and v2) and systemd driver.
    assert_eq!(
        ids(&format!("/docker/{ID}")),
        (Some(ID.into()), Some("docker"), None)
    );
    assert_eq!(
        ids(&format!("/system.slice/docker-{ID}.scope")),
        (Some(ID.into()), Some("docker"), None)
    );
}

#[test]
fn containerd_and_crio_under_kubernetes_systemd_slices() {
    let u = UID.replace('-', "_");
    assert_eq!(
        ids(&format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{ID}.scope"
        )),
        (Some(ID.into()), Some("containerd"), Some(UID.into()))
    );
    assert_eq!(
        ids(&format!(
            "/kubepods.slice/kubepods-pod{u}.slice/crio-{ID}.scope"
        )),
        (Some(ID.into()), Some("cri-o"), Some(UID.into()))
    );
    // The runtime's monitor process is in the pod but is no container.
    assert_eq!(
        ids(&format!(
            "/kubepods.slice/kubepods-pod{u}.slice/crio-conmon-{ID}.scope"
        )),
        (None, None, Some(UID.into()))
    );
}

#[test]
fn kubernetes_cgroupfs_driver() {
    // cgroup v1 (a controller's path) and v2 with the cgroupfs driver.
    assert_eq!(
        ids(&format!("/kubepods/besteffort/pod{UID}/{ID}")),
        (Some(ID.into()), None, Some(UID.into()))
    );
    assert_eq!(
        ids(&format!("/kubepods/pod{UID}/{ID}")),
        (Some(ID.into()), None, Some(UID.into()))
    );
    // A static pod's UID is its config hash: 32 hex digits.
    let hash = "6f1c2b3a4d5e6f708192a3b4c5d6e7f8";
    assert_eq!(
        ids(&format!("/kubepods/burstable/pod{hash}/{ID}")).2,
        Some(hash.into())
    );
}

#[test]
fn podman_systemd_and_plain_processes() {
    assert_eq!(
        ids(&format!("/machine.slice/libpod-{ID}.scope")),
        (Some(ID.into()), Some("podman"), None)
    );
    assert_eq!(
        ids(&format!("/machine.slice/libpod-conmon-{ID}.scope")),
        (None, None, None)
    );
    assert_eq!(
        ids("/system.slice/nvidia-persistenced.service"),
        (None, None, None)
    );
    assert_eq!(
        ids("/user.slice/user-0.slice/session-3.scope"),
        (None, None, None)
    );
    assert_eq!(ids("/"), (None, None, None));
    // Not an id: wrong length or not hex.
    assert_eq!(ids("/docker/abc123"), (None, None, None));
    assert_eq!(ids("/kubepods/podnot-a-uid/x"), (None, None, None));
}

/// A user's systemd manager (or a container with a delegated cgroup) can create any
/// name below its own cgroup: a pod's or a container's name there is not theirs.
#[test]
fn names_where_users_can_write_them_are_nobodys() {
    let u = UID.replace('-', "_");
    for forged in [
        format!(
            "/user.slice/user-1000.slice/user@1000.service/app.slice/kubepods-besteffort-pod{u}.slice/cri-containerd-{ID}.scope"
        ),
        format!("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"),
        format!("/user.slice/user-1000.slice/user@1000.service/docker-{ID}.scope"),
        format!(
            "/system.slice/docker-{ID}.scope/kubepods.slice/kubepods-pod{u}.slice/crio-{ID}.scope"
        )
        .replace(&format!("docker-{ID}.scope"), "tenant.scope"),
        format!("/junction-test.slice/docker-{ID}.scope"),
        format!("/machine.slice/docker-{ID}.scope"),
        format!("/a/kubepods/pod{UID}/{ID}"),
        format!("/user.slice/docker/{ID}"),
    ] {
        let got = ids(&forged);
        assert_eq!(got.0, None, "{forged}");
        assert_eq!(got.2, None, "{forged}");
    }
    // In the kubelet's pod slice but not where a runtime puts a container: the pod, no
    // container.
    assert_eq!(
        ids(&format!(
            "/kubepods.slice/kubepods-pod{u}.slice/nested/cri-containerd-{ID}.scope"
        )),
        (None, None, Some(UID.into()))
    );
    // Seen from inside a cgroup namespace: the common ancestors cut.
    assert_eq!(
        ids(&format!(
            "/../../../kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{ID}.scope"
        )),
        (Some(ID.into()), Some("containerd"), Some(UID.into()))
    );
    assert_eq!(
        ids(&format!("/../../system.slice/docker-{ID}.scope")),
        (Some(ID.into()), Some("docker"), None)
    );
    assert_eq!(ids(&format!("/../docker-{ID}.scope")).0, Some(ID.into()));
    assert_eq!(
        ids(&format!(
            "/../../user.slice/user-1000.slice/user@1000.service/kubepods-pod{u}.slice/crio-{ID}.scope"
        )),
        (None, None, None)
    );
    assert_eq!(
        ids(&format!("/system.slice/../docker-{ID}.scope")),
        (None, None, None)
    );
    // A container's own sub-cgroup is still that container.
    assert_eq!(
        ids(&format!(
            "/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{ID}.scope/init.scope"
        )),
        (Some(ID.into()), Some("containerd"), Some(UID.into()))
    );
}

#[test]
fn proc_cgroup_files_v1_and_v2() {
    let v2 = format!("0::/system.slice/docker-{ID}.scope\n");
    assert_eq!(cgroup_of(&v2), format!("/system.slice/docker-{ID}.scope"));
    let v1 = format!(
        "12:cpuset:/\n11:memory:/kubepods/burstable/pod{UID}/{ID}\n10:pids:/kubepods/burstable/pod{UID}/{ID}\n1:name=systemd:/kubepods/burstable/pod{UID}/{ID}\n"
    );
    assert_eq!(cgroup_of(&v1), format!("/kubepods/burstable/pod{UID}/{ID}"));
    // Hybrid: the line that names the container wins, wherever it is.
    let hybrid = format!("0::/init.scope\n5:memory:/docker/{ID}\n");
    assert_eq!(cgroup_of(&hybrid), format!("/docker/{ID}"));
    assert_eq!(cgroup_of("1:cpu:/a\n0::/b\n"), "/b");
    assert_eq!(cgroup_of("garbage"), "");
}

#[test]
fn this_process_reads_from_proc() {
    let me = read_process(Path::new("/proc"), std::process::id()).expect("self in /proc");
    assert!(read_process(Path::new("/proc"), u32::MAX - 2).is_none());
    // The executable's name (comm is cut at 15 bytes; the name is not).
    let exe = std::env::current_exe().expect("exe");
    assert_eq!(
        Some(me.name.as_str()),
        exe.file_name().and_then(|n| n.to_str())
    );
    // Field 22 of /proc/self/stat, counted after the parenthesised comm.
    let stat = std::fs::read_to_string("/proc/self/stat").expect("stat");
    let after = stat.rsplit_once(") ").map(|(_, r)| r).expect("stat fields");
    let ticks: u64 = after
        .split_whitespace()
        .nth(22 - 3)
        .and_then(|v| v.parse().ok())
        .expect("starttime");
    assert_eq!(me.start_ticks, ticks);
    let table = Processes::default();
    let a = table.identify(std::process::id(), None);
    let b = table.identify(std::process::id(), None);
    assert!(Arc::ptr_eq(&a, &b), "cached");
    // A pid not in /proc: the hint names it.
    let gone = table.identify(
        u32::MAX - 1,
        Some(&Hint {
            comm: "short".into(),
            cgroup: Some(format!("/docker/{ID}")),
        }),
    );
    assert_eq!(gone.name, "short");
    assert_eq!(gone.container_id.as_deref(), Some(ID));
    table.ended(u32::MAX - 1);
    table.prune(Duration::ZERO, Duration::from_secs(60));
    assert_eq!(table.len(), 1);
}

#[test]
fn names_come_from_proc_when_visible() {
    let dir = std::env::temp_dir().join(format!("junction-proc-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("77")).expect("dir");
    std::fs::write(dir.join("77/comm"), "trainer\n").expect("comm");
    assert_eq!(proc_name(&dir, 77).as_deref(), Some("trainer"));
    assert_eq!(proc_name(&dir, 78), None);
    assert_eq!(basename("/opt/venv/bin/python3.11"), "python3.11");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A program run through the dynamic loader (its exe is the loader: on a real GPU host, short
/// CUDA processes were named `ld-linux-x86-64.so.2`) is named after the program its command
/// line gives, past the loader's options.
#[test]
fn a_program_run_by_the_loader_is_named_after_the_program() {
    let c = |args: &[&str]| args.join("\0").into_bytes();
    assert_eq!(
        loaded_program(&c(&[
            "/lib64/ld-linux-x86-64.so.2",
            "/usr/bin/nvidia-smi",
            "-L"
        ]))
        .as_deref(),
        Some("nvidia-smi")
    );
    assert_eq!(
        loaded_program(&c(&[
            "ld-linux-x86-64.so.2",
            "--library-path",
            "/nix/store/x-driver/lib",
            "--inhibit-cache",
            "--argv0",
            "trainer",
            "/nix/store/y/bin/.trainer-wrapped",
        ]))
        .as_deref(),
        Some(".trainer-wrapped")
    );
    assert_eq!(loaded_program(&c(&["ld.so", "--list"])), None);
    assert_eq!(loaded_program(b""), None);
    // Through /proc: the loader's exe, the program's name.
    let dir = std::env::temp_dir().join(format!("junction-loader-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("91")).expect("dir");
    let loader = dir.join("ld-linux-x86-64.so.2");
    std::fs::write(&loader, "").expect("loader");
    std::os::unix::fs::symlink(&loader, dir.join("91/exe")).expect("exe");
    std::fs::write(
        dir.join("91/cmdline"),
        c(&[
            "/lib64/ld-linux-x86-64.so.2",
            "/opt/cuda/bin/bandwidthTest",
            "",
        ]),
    )
    .expect("cmdline");
    assert_eq!(proc_name(&dir, 91).as_deref(), Some("bandwidthTest"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn slurm_jobs_v1_and_v2() {
    let job = |p: &str| parse_cgroup_path(p).slurm_job;
    // cgroup/v2 plugin: slurmstepd's scope, the job, its step, the task.
    assert_eq!(
        job("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0"),
        Some("4242".into())
    );
    assert_eq!(
        job("/system.slice/slurmstepd.scope/job_77/step_batch"),
        Some("77".into())
    );
    // cgroup/v1 plugin, plain and with NodeName (multiple slurmd per host).
    assert_eq!(
        job("/slurm/uid_1000/job_4242/step_0/task_1"),
        Some("4242".into())
    );
    assert_eq!(
        job("/slurm_node07/uid_0/job_9/step_extern"),
        Some("9".into())
    );
    // A v1 line wins over the unified line on hybrid hosts.
    let text = "12:freezer:/slurm/uid_1000/job_55/step_0/task_0\n0::/user.slice\n";
    assert_eq!(cgroup_of(text), "/slurm/uid_1000/job_55/step_0/task_0");
}

#[test]
fn slurm_lookalikes_are_not_jobs() {
    let job = |p: &str| parse_cgroup_path(p).slurm_job;
    // A tenant's own systemd manager or delegated subtree names what it likes.
    assert_eq!(
        job("/user.slice/user-1000.slice/slurmstepd.scope/job_1"),
        None
    );
    assert_eq!(job("/system.slice/slurmstepd.scope/job_x1"), None);
    assert_eq!(job("/system.slice/slurmstepd.scope/job_"), None);
    assert_eq!(
        job("/system.slice/slurmstepd.scope/job_123456789012345678901"),
        None
    );
    assert_eq!(job("/slurm/uid_x/job_1/step_0"), None);
    assert_eq!(job("/slurmish/job_1"), None);
    assert_eq!(job("/system.slice/slurmstepd.scope/../job_1"), None);
}
