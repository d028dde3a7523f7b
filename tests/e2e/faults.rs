//! Degraded nodes: an old driver, a GPU that falls off the bus, a call that hangs.

use std::time::{Duration, Instant};

use crate::support::{self, Agent, parse, value};

fn energy(body: &str, gpu: &str) -> f64 {
    value(&parse(body), "hw_energy_joules_total", &[("hw_id", gpu)])
        .unwrap_or_else(|| panic!("no energy for {gpu}"))
}

/// Old driver: unsupported metrics are absent, listed by `inventory`, logged once each (one
/// start-up line per feature naming both GPUs, not one per GPU); the v1 fallbacks (memory,
/// process lists) keep the basics flowing.
#[test]
fn old_driver_disables_what_it_lacks() {
    let mut agent = Agent::start("old-driver.toml", "legacy");
    // Let several 1 s cycles pass so that a repeated log line would show.
    std::thread::sleep(Duration::from_secs(3));
    let body = agent.wait_for(Duration::from_secs(10), |m| {
        m.contains("gpu_memory_retired_pages")
    });
    let s = parse(&body);
    let g0 = support::uuids(&s)[0].clone();
    let on = |name: &str, extra: &[(&str, &str)]| {
        let mut l = vec![("hw_id", g0.as_str())];
        l.extend_from_slice(extra);
        value(&s, name, &l)
    };
    assert_eq!(
        on("hw_gpu_memory_usage_bytes", &[]),
        Some(9400.0 * 1024.0 * 1024.0),
        "v1 memory fallback"
    );
    assert_eq!(
        on(
            "gpu_memory_retired_pages",
            &[("gpu_retirement_cause", "multiple_single_bit")]
        ),
        Some(2.0)
    );
    // old-driver.toml: pid 3100 uses 9000 MiB (a wrong entry layout still finds the pid).
    assert_eq!(
        on("gpu_process_memory_usage_bytes", &[("process_pid", "3100")]),
        Some(9000.0 * 1024.0 * 1024.0),
        "v2 process list fallback"
    );
    assert_eq!(
        on(
            "hw_temperature_celsius",
            &[("hw_sensor_location", "gpu_die")]
        ),
        Some(58.0)
    );
    for absent in [
        "gpu_memory_remapped_rows",
        "gpu_sm_activity_ratio",
        "gpu_recovery_action",
        "gpu_memory_reserved_bytes",
    ] {
        assert!(
            !body.contains(&format!("{absent}{{")),
            "{absent} should be absent on the old driver"
        );
    }
    assert!(
        !body.contains("memory_junction\""),
        "no memory-junction temperature on a V100"
    );

    let log = agent.log();
    for feature in [
        "temperature_memory",
        "memory_info_v2",
        "gpm",
        "remapped_rows",
    ] {
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("disabled") && l.contains(&format!("feature=\"{feature}\"")))
            .collect();
        assert_eq!(
            lines.len(),
            1,
            "{feature} logged once for the node, got {lines:#?}:\n{log}"
        );
        assert!(lines[0].contains("gpus=0,1"), "{}", lines[0]);
    }
    assert!(agent.terminate().success());

    let out = support::inventory(&agent.config, Some("old-driver.toml"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "inventory failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("Tesla V100-SXM2-16GB"), "{text}");
    assert!(
        text.contains("memory_info_v2: not in this driver's NVML"),
        "{text}"
    );
    assert!(
        text.contains("temperature_memory: NOT_SUPPORTED on this GPU"),
        "{text}"
    );
    assert!(text.contains("gpm: not in this driver's NVML"), "{text}");
}

/// GPU 3 falls off the bus after 10 s: reported failed, the others keep updating, no panic,
/// SIGTERM exits 0.
#[test]
fn lost_gpu_is_failed_and_the_others_go_on() {
    let mut agent = Agent::start("gpu-lost.toml", "current");
    let first = support::scrape(agent.port, Duration::from_secs(5)).expect("scrape");
    let ids = support::uuids(&parse(&first));
    let g3 = ids[3].clone();
    let failed = |m: &str| {
        value(
            &parse(m),
            "hw_status",
            &[("hw_id", g3.as_str()), ("hw_state", "failed")],
        ) == Some(1.0)
    };
    let body = agent.wait_for(Duration::from_secs(30), failed);
    let s = parse(&body);
    assert_eq!(
        value(
            &s,
            "hw_status",
            &[("hw_id", g3.as_str()), ("hw_state", "ok")]
        ),
        Some(0.0)
    );
    assert_eq!(
        support::scraped_readings_of(&body, &g3),
        Vec::<String>::new(),
        "a lost GPU's readings are withdrawn"
    );
    assert!(agent.log().contains("GPU failed"), "{}", agent.log());
    // The other seven keep updating: their energy counters move between two scrapes.
    let before = body.clone();
    std::thread::sleep(Duration::from_millis(2500));
    let after = support::scrape(agent.port, Duration::from_secs(5)).expect("scrape");
    for (i, g) in ids.iter().enumerate().filter(|(i, _)| *i != 3) {
        assert!(
            energy(&after, g) > energy(&before, g),
            "GPU {i} stopped updating"
        );
        assert_eq!(
            value(
                &parse(&after),
                "hw_status",
                &[("hw_id", g.as_str()), ("hw_state", "ok")]
            ),
            Some(1.0)
        );
    }
    assert!(!agent.log().contains("panicked"), "{}", agent.log());
    // The NVML source is up (one GPU failed is the GPU's state, not the source's).
    let health =
        support::get(agent.port, "/healthz", Duration::from_secs(5)).expect("/healthz answers 200");
    assert_eq!(health, "ok\n");
    assert!(agent.terminate().success(), "SIGTERM exits 0");
}

/// A hanging NVML call: `/metrics` keeps answering within a second, the stuck GPU is reported,
/// the other GPUs keep updating, intermittent errors are counted, and SIGTERM still exits 0.
#[test]
fn hanging_call_is_reported_and_isolated() {
    let mut agent = Agent::start("hang.toml", "current");
    let first = support::scrape(agent.port, Duration::from_secs(5)).expect("scrape");
    let ids = support::uuids(&parse(&first));
    let g2 = ids[2].clone();
    let stuck =
        |m: &str| value(&parse(m), "junction_nvml_stuck", &[("hw_id", g2.as_str())]) == Some(1.0);
    let body = agent.wait_for(Duration::from_secs(30), stuck);
    let s = parse(&body);
    assert_eq!(
        value(
            &s,
            "hw_status",
            &[("hw_id", g2.as_str()), ("hw_state", "degraded")]
        ),
        Some(1.0)
    );
    assert!(
        value(
            &s,
            "junction_nvml_timeouts_total",
            &[("hw_id", g2.as_str())]
        ) >= Some(1.0)
    );
    assert!(
        agent.log().contains("NVML call is stuck"),
        "{}",
        agent.log()
    );
    let before = body.clone();
    let mut last = String::new();
    for _ in 0..5 {
        last = support::scrape(agent.port, Duration::from_secs(1))
            .expect("/metrics answers within a second while a call hangs");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        energy(&last, &ids[0]) > energy(&before, &ids[0]),
        "GPU 0 keeps updating"
    );
    assert!(stuck(&last), "GPU 2 is still stuck");
    // Intermittent NVML_ERROR_UNKNOWN on GPU 6's PCIe throughput: counted, never fatal.
    let s = parse(&last);
    let errors = s
        .iter()
        .filter(|x| {
            x.name == "junction_source_errors_total" && x.labels.get("hw_id") == Some(&ids[6])
        })
        .map(|x| x.value)
        .sum::<f64>();
    assert!(errors >= 1.0, "intermittent errors are counted");
    let warned = agent
        .log()
        .lines()
        .filter(|l| l.contains("NVML call failed") && l.contains(&ids[6]))
        .count();
    assert!(
        warned <= 2,
        "intermittent errors are not logged every cycle ({warned} lines)"
    );
    assert!(
        agent.terminate().success(),
        "SIGTERM exits 0 even with a thread stuck in NVML"
    );
}

/// No NVML on the host (the library cannot be loaded): the agent keeps serving, says the
/// source is down on `/metrics` and `/healthz`, and exits 0 on SIGTERM.
#[test]
fn missing_nvml_library_keeps_the_agent_serving() {
    let dir = support::temp_dir();
    let port = support::free_port();
    let config = dir.join("junction.toml");
    std::fs::write(
        &config,
        format!("[sources.nvml]\nlibrary = \"libnvidia-ml-absent.so.1\"\n[sinks.prometheus]\nlisten = \"127.0.0.1:{port}\"\n"),
    )
    .expect("config");
    let stderr = dir.join("stderr.log");
    let child = support::junction()
        .arg("--config")
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&stderr).expect("log"))
        .spawn()
        .expect("spawn");
    let mut agent = Agent {
        child,
        port,
        stderr,
        config,
    };
    assert_nvml_down(&mut agent);
    assert!(
        agent.log().contains("NVML source failed to start"),
        "{}",
        agent.log()
    );
    assert!(
        agent.log().contains("libnvidia-ml-absent.so.1"),
        "the log names the library: {}",
        agent.log()
    );
    let log = agent.log();
    assert_eq!(
        log.matches("cannot open shared object file").count(),
        1,
        "the cause is said once: {log}"
    );
    assert!(
        log.contains("NVIDIA container runtime") && log.contains("sources.nvml.library"),
        "the error says what to do: {log}"
    );
    assert!(agent.terminate().success());
}

/// nvmlInit never returns (a wedged driver): `/metrics` answers from the start with the NVML
/// source down, the deadline (`init_timeout_secs`) is logged, and SIGTERM exits 0 even while
/// the initialisation is still pending.
#[test]
fn hanging_init_is_reported_and_the_agent_serves() {
    let mut agent = Agent::spawn("init-hang.toml", "current", "init_timeout_secs = 2");
    let body = assert_nvml_down(&mut agent);
    assert!(!body.contains("hw_status"), "no GPU is known without NVML");
    let start = Instant::now();
    while !agent.log().contains("did not return within 2 s") {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "deadline not logged: {}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        agent.terminate().success(),
        "SIGTERM exits 0 with the init thread stuck"
    );

    let mut pending = Agent::spawn("init-hang.toml", "current", "init_timeout_secs = 600");
    pending.wait_for(Duration::from_secs(30), |m| {
        m.contains("junction_source_up")
    });
    assert!(
        pending.terminate().success(),
        "SIGTERM exits 0 while NVML is still starting"
    );
    // Every source stopped within the deadline: none was left waiting for NVML's list.
    assert!(!pending.log().contains("left behind"), "{}", pending.log());
}

/// `/metrics` answers with the NVML source down and `/healthz` does not answer 200; returns the
/// scrape.
fn assert_nvml_down(agent: &mut Agent) -> String {
    let body = agent.wait_for(Duration::from_secs(30), |m| {
        m.contains("junction_source_up")
    });
    assert_eq!(
        value(
            &parse(&body),
            "junction_source_up",
            &[("junction_source", "nvml")]
        ),
        Some(0.0)
    );
    let health = support::get(agent.port, "/healthz", Duration::from_secs(5));
    assert!(
        health.is_err(),
        "/healthz must not answer 200 with the NVML source down"
    );
    body
}

/// `junction inventory` on a host without NVML: the NVML error, and beside it what every
/// other source is doing (the kernel log's inputs and whether they can be read, eBPF, the
/// host and bus sources, the BMC sources that are off); the exit status says NVML failed.
#[test]
fn inventory_without_nvml_shows_what_the_other_sources_do() {
    let dir = support::temp_dir();
    let kern = dir.join("kern.log");
    std::fs::write(&kern, "").expect("kern.log");
    let missing = dir.join("not-yet.log");
    let port = support::free_port();
    let base = support::sim_config("current", port, "");
    let library = base
        .lines()
        .find(|l| l.starts_with("library = "))
        .expect("a library line")
        .to_string();
    let cfg = base.replace(&library, "library = \"libnvidia-ml-absent.so.1\"")
        + &format!(
            "\n[sources.kmsg]\ndevice = \"\"\nfiles = [{:?}, {:?}]\n",
            kern.display().to_string(),
            missing.display().to_string()
        );
    let path = dir.join("junction.toml");
    std::fs::write(&path, cfg).expect("config");
    let out = support::inventory(&path, None);
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "NVML failed: {text}");
    assert!(err.contains("cannot initialise NVML"), "{err}");
    let section = |name: &str| -> String {
        text.split(&format!("\nSource {name}:\n"))
            .nth(1)
            .unwrap_or_else(|| panic!("no Source {name} section:\n{text}"))
            .split("\n\n")
            .next()
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        section("nvml").contains("on; failed: cannot initialise NVML"),
        "{text}"
    );
    let kmsg = section("kmsg");
    assert!(
        kmsg.contains(&format!("file {}: readable", kern.display())),
        "{kmsg}"
    );
    assert!(
        kmsg.contains(&format!("file {}: cannot open", missing.display())),
        "{kmsg}"
    );
    assert!(!kmsg.contains("device "), "no device configured: {kmsg}");
    // Attached or not (the binary may lack its BPF programs, the kernel its probes), it
    // says which, below its status line.
    let ebpf = section("ebpf");
    assert!(
        ebpf.starts_with("  on; runs under `junction run` only\n  "),
        "{ebpf}"
    );
    assert!(ebpf.lines().count() >= 2, "{ebpf}");
    assert!(
        section("redfish").contains("off in the configuration"),
        "{text}"
    );
    assert!(
        section("ipmi").contains("off in the configuration"),
        "{text}"
    );
    assert!(section("pcie").starts_with("  on; "), "{text}");
}

/// The agent's threads named `nvml-collect…`.
fn collecting_threads(agent: &Agent) -> usize {
    std::fs::read_dir(format!("/proc/{}/task", agent.child.id()))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.starts_with("nvml-collect"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// One thread collects every GPU. A call that stalls past its deadline and then returns: while
/// it is held, the watchdog has started a second thread and the other GPUs keep updating; when
/// it returns, the stuck mark clears, that GPU updates again and the second thread ends.
#[test]
fn a_call_held_past_its_deadline_hands_the_others_to_another_thread_until_it_returns() {
    let mut agent = Agent::start("hang-returns.toml", "current");
    assert_eq!(collecting_threads(&agent), 1, "one thread collects");
    let ids = support::uuids(&parse(
        &support::scrape(agent.port, Duration::from_secs(5)).expect("scrape"),
    ));
    let g3 = ids[3].clone();
    let stuck = |m: &str| value(&parse(m), "junction_nvml_stuck", &[("hw_id", g3.as_str())]);
    let held = agent.wait_for(Duration::from_secs(20), |m| stuck(m) == Some(1.0));
    assert_eq!(
        collecting_threads(&agent),
        2,
        "a second thread collects while GPU 3 holds the first"
    );
    std::thread::sleep(Duration::from_millis(1200));
    let later = support::scrape(agent.port, Duration::from_secs(1)).expect("scrape");
    assert_eq!(stuck(&later), Some(1.0), "GPU 3 is held for 4 s");
    assert!(
        energy(&later, &ids[0]) > energy(&held, &ids[0]),
        "GPU 0 keeps updating while GPU 3 is held"
    );
    let back = agent.wait_for(Duration::from_secs(20), |m| stuck(m) == Some(0.0));
    assert!(
        agent
            .log()
            .contains("NVML call returned after its deadline"),
        "{}",
        agent.log()
    );
    let fresh = agent.wait_for(Duration::from_secs(10), |m| {
        energy(m, &g3) > energy(&back, &g3)
    });
    assert_eq!(stuck(&fresh), Some(0.0));
    let start = Instant::now();
    while collecting_threads(&agent) > 1 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        collecting_threads(&agent),
        1,
        "the second thread ends once no GPU holds one"
    );
    assert!(agent.terminate().success(), "SIGTERM exits 0");
}

/// A panic in one GPU's collection (a defect of Junction's; a debug build's failpoint makes
/// it here, twice): it is counted in `junction_source_errors_total` with the GPU's `hw_id`
/// and logged, the GPU is opened again after a backoff (1 s, then 2 s) and collected again,
/// its verdict never moves, and the other GPUs never stop.
#[test]
fn a_gpu_whose_collection_panics_is_counted_and_opened_again() {
    let port = support::free_port();
    let mut agent = Agent::spawn_config_env(
        "h100-training.toml",
        &support::sim_config("current", port, ""),
        &[("JUNCTION_FAILPOINT_NVML_PANIC", "2:2")],
    );
    let panics = |m: &str, gpu: &str| {
        value(
            &parse(m),
            "junction_source_errors_total",
            &[
                ("junction_source", "nvml"),
                ("junction_stage", "task"),
                ("error_type", "panic"),
                ("hw_id", gpu),
            ],
        )
    };
    let first = agent.wait_for(Duration::from_secs(30), |m| m.contains(support::NVML_UP));
    let ids = support::uuids(&parse(&first));
    let g2 = ids[2].clone();
    // Opened again after 1 s, panics again, opened again after 2 s: then collected.
    let collected = agent.wait_for(Duration::from_secs(30), |m| {
        panics(m, &g2) == Some(2.0)
            && value(
                &parse(m),
                "hw_energy_joules_total",
                &[("hw_id", g2.as_str())],
            )
            .is_some()
    });
    let later = agent.wait_for(Duration::from_secs(10), |m| {
        energy(m, &g2) > energy(&collected, &g2)
    });
    assert_eq!(panics(&later, &g2), Some(2.0), "two panics, no more");
    for (i, g) in ids.iter().enumerate() {
        assert_eq!(
            value(
                &parse(&later),
                "hw_status",
                &[("hw_id", g.as_str()), ("hw_state", "ok")]
            ),
            Some(1.0),
            "GPU {i}'s verdict"
        );
        if i != 2 {
            assert_eq!(panics(&later, g), None, "GPU {i}");
            assert!(
                energy(&later, g) > energy(&first, g),
                "GPU {i} kept updating"
            );
        }
    }
    // Logged once a minute at most, like every failed read (the counter has each).
    let log = agent.log();
    assert_eq!(
        log.matches("NVML collection of this GPU panicked; restarting it in 1s")
            .count(),
        1,
        "{log}"
    );
    assert!(log.contains("JUNCTION_FAILPOINT_NVML_PANIC"), "{log}");
    assert!(log.contains(&g2), "{log}");
    // The source stays up: one GPU's panic is not the source's.
    let health =
        support::get(agent.port, "/healthz", Duration::from_secs(5)).expect("/healthz answers 200");
    assert_eq!(health, "ok\n");
    assert!(agent.terminate().success(), "SIGTERM exits 0");
}
