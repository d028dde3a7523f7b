//! The Redfish transport end to end: basic auth over TLS against `sushy-emulator`, a slow
//! and a silent BMC, and sessions (reused, recreated once when they expire, deleted at
//! shutdown) against a BMC written here and DMTF's Redfish-Mockup-Server.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::bmc::{self, BadBmc, DynamicBmc};
use crate::support::{self, Agent, parse, value};

use crate::bmc::{config, once, redfish_target, shared_redfish};

#[test]
fn sushy_emulator_basic_auth_over_tls() {
    let Some(tool) = bmc::venv_tool("sushy-emulator") else {
        return;
    };
    let ca = support::otlp::test_ca();
    let server = bmc::sushy_emulator(
        &tool,
        "monitor",
        "s3cret-pass",
        &ca.server.cert,
        &ca.server.key,
    );
    let dir = support::temp_dir();
    let (caf, good, bad) = (dir.join("ca.pem"), dir.join("good"), dir.join("bad"));
    std::fs::write(&caf, &ca.ca).expect("ca");
    std::fs::write(&good, "s3cret-pass\n").expect("pw");
    std::fs::write(&bad, "wrong-pass\n").expect("pw");
    let url = format!("https://127.0.0.1:{}", server.port);
    let target = |pw: &Path, extra: &str| {
        redfish_target(
            "emu",
            &url,
            &format!(
                "username = \"monitor\"\npassword_file = {:?}\n{extra}",
                pw.display().to_string()
            ),
        )
    };
    // Trusted CA, right password: the emulator's (legacy Thermal) readings.
    let (ok, out, err) = once(&config(
        &target(&good, &format!("ca_file = {:?}", caf.display().to_string())),
        false,
        support::free_port(),
    ));
    assert!(
        ok,
        "{err}\n{}",
        std::fs::read_to_string(&server.log).unwrap_or_default()
    );
    let s = parse(&out);
    assert_eq!(
        value(&s, "junction_target_up", &[("junction_target", "emu")]),
        Some(1.0)
    );
    assert!(
        s.iter()
            .any(|x| x.name == "hw_temperature_celsius" && x.value == 41.0),
        "CPU Temp 41 C:\n{out}"
    );
    assert!(
        s.iter()
            .any(|x| x.name == "hw_fan_speed_rpm" && x.value == 2100.0),
        "a fan at 2100 RPM"
    );
    // An untrusted certificate is refused, saying what to do.
    let (ok, _, err) = once(&config(&target(&good, ""), false, support::free_port()));
    assert!(!ok);
    assert!(err.contains("TLS") && err.contains("ca_file"), "{err}");
    // ... unless configured.
    let (ok, out, err) = once(&config(
        &target(&good, "insecure = true"),
        false,
        support::free_port(),
    ));
    assert!(ok, "{err}");
    assert!(err.contains("verification is off"), "a warning: {err}");
    assert_eq!(
        value(
            &parse(&out),
            "junction_target_up",
            &[("junction_target", "emu")]
        ),
        Some(1.0)
    );
    // A wrong password: up 0, a clear error, no crash, the other sources go on, no secret in
    // the log.
    let port = support::free_port();
    let mut agent = Agent::spawn_config(
        "h100-training.toml",
        &config(
            &target(
                &bad,
                &format!(
                    "ca_file = {:?}\ninterval_secs = 1",
                    caf.display().to_string()
                ),
            ),
            true,
            port,
        ),
    );
    let body = agent.wait_for(Duration::from_secs(30), |m| {
        value(
            &parse(m),
            "junction_target_poll_failures_total",
            &[("junction_target", "emu"), ("error_type", "auth")],
        )
        .is_some()
            && m.contains("hw_gpu_memory_usage_bytes")
    });
    assert_eq!(
        value(
            &parse(&body),
            "junction_target_up",
            &[("junction_target", "emu")]
        ),
        Some(0.0)
    );
    let log = agent.log();
    assert!(log.contains("authentication failed"), "{log}");
    assert!(
        !log.contains("wrong-pass") && !log.contains("s3cret"),
        "no password in the log"
    );
    assert!(
        agent.child.try_wait().expect("status").is_none(),
        "still running"
    );
}

#[test]
fn a_slow_and_a_silent_bmc_time_out_on_schedule_never_overlap_and_hold_nothing_up() {
    let slow = BadBmc::start(Some(Duration::from_secs(3)));
    let silent = BadBmc::start(None);
    let port = support::free_port();
    let sections = redfish_target(
        "slow",
        &format!("http://127.0.0.1:{}", slow.port),
        "timeout_secs = 2\ninterval_secs = 1",
    ) + &redfish_target(
        "silent",
        &format!("http://127.0.0.1:{}", silent.port),
        "timeout_secs = 2\ninterval_secs = 1",
    );
    let mut agent = Agent::spawn_config("h100-training.toml", &config(&sections, true, port));
    let start = Instant::now();
    let body = agent.wait_for(Duration::from_secs(30), |m| {
        let s = parse(m);
        ["slow", "silent"].iter().all(|t| {
            value(
                &s,
                "junction_target_poll_failures_total",
                &[("junction_target", t), ("error_type", "timeout")],
            )
            .is_some_and(|n| n >= 3.0)
        })
    });
    let elapsed = start.elapsed().as_secs_f64();
    let s = parse(&body);
    for (t, b) in [("slow", &slow), ("silent", &silent)] {
        assert_eq!(
            value(&s, "junction_target_up", &[("junction_target", t)]),
            Some(0.0)
        );
        let d = value(
            &s,
            "junction_target_poll_duration_seconds",
            &[("junction_target", t)],
        )
        .expect("duration");
        assert!(
            (2.0..3.0).contains(&d),
            "{t}: a poll ends at its 2 s timeout, took {d}"
        );
        // One poll at a time: never two connections open at once, although each poll lasts
        // twice the interval.
        assert_eq!(
            b.max_open(Duration::from_millis(250)),
            1,
            "{t}: polls overlapped"
        );
        let polls = b.connections() as f64;
        assert!(
            polls <= elapsed / 2.0 + 2.0,
            "{t}: {polls} polls in {elapsed:.1} s, each lasting 2 s"
        );
    }
    // NVML is unaffected while the BMCs hang: GPU 0's energy counter moves between two
    // scrapes (a stalled collection would leave the old series in place).
    let energy = |m: &str| {
        let s = parse(m);
        let gpu = support::uuids(&s).first().cloned().unwrap_or_default();
        value(&s, "hw_energy_joules_total", &[("hw_id", &gpu)]).unwrap_or(0.0)
    };
    let before = support::scrape(agent.port, Duration::from_secs(5)).expect("scrape");
    std::thread::sleep(Duration::from_millis(2500));
    let after = support::scrape(agent.port, Duration::from_secs(5)).expect("scrape");
    assert!(
        energy(&after) > energy(&before),
        "NVML stopped updating while the BMCs hang: {} then {}",
        energy(&before),
        energy(&after)
    );
    assert!(body.contains("hw_gpu_memory_usage_bytes"));
    assert!(agent.log().contains("Redfish poll failed"));
}

/// One chassis with eight temperature sensors: a walk that fans out.
fn eight_sensors(path: &str, _t: f64) -> Option<Value> {
    let r = "/redfish/v1";
    let sensors = format!("{r}/Chassis/1/Sensors");
    Some(match path.trim_start_matches(r) {
        "" => {
            json!({"@odata.id": r, "Chassis": {"@odata.id": format!("{r}/Chassis")}, "SessionService": {"@odata.id": format!("{r}/SessionService")}})
        }
        "/Chassis" => json!({"Members": [{"@odata.id": format!("{r}/Chassis/1")}]}),
        "/Chassis/1" => json!({"Id": "1", "Name": "Node", "Sensors": {"@odata.id": sensors}}),
        "/Chassis/1/Sensors" => {
            json!({"Members": (0..8).map(|i| json!({"@odata.id": format!("{sensors}/T{i}")})).collect::<Vec<_>>()})
        }
        p => {
            let i: u32 = p.strip_prefix("/Chassis/1/Sensors/T")?.parse().ok()?;
            json!({"@odata.id": format!("{sensors}/T{i}"), "Id": format!("T{i}"), "Name": format!("T{i}"), "Reading": 30 + i, "ReadingType": "Temperature", "ReadingUnits": "Cel"})
        }
    })
}

/// `auth = "session"` against a BMC that enforces sessions: one session for many polls, one
/// new session when it expires (also when requests in flight are refused together), a wrong
/// password refused without the password in the log, the session deleted at shutdown.
#[test]
fn redfish_sessions_are_reused_recreated_once_when_they_expire_and_deleted_at_shutdown() {
    let bmc = DynamicBmc::with_sessions("monitor", "s3cret-pw", eight_sensors);
    let sessions = bmc.sessions.clone().expect("sessions");
    let dir = support::temp_dir();
    let (good, bad) = (dir.join("good"), dir.join("bad"));
    std::fs::write(&good, "s3cret-pw\n").expect("pw");
    std::fs::write(&bad, "wrong-pw\n").expect("pw");
    let url = format!("http://127.0.0.1:{}", bmc.port);
    let extra = |pw: &Path| {
        format!(
            "username = \"monitor\"\npassword_file = {:?}\nauth = \"session\"\ninterval_secs = 1\nexpand = false\nmax_concurrent_requests = 4",
            pw.display().to_string()
        )
    };
    let port = support::free_port();
    let sections =
        redfish_target("bmc", &url, &extra(&good)) + &redfish_target("wrong", &url, &extra(&bad));
    let mut agent = Agent::spawn_config("h100-training.toml", &config(&sections, false, port));
    let requests = |m: &str| {
        value(
            &parse(m),
            "junction_target_requests_total",
            &[("junction_target", "bmc")],
        )
        .unwrap_or(0.0)
    };
    // A poll is 12 requests (root, chassis collection, chassis, sensor collection, 8 sensors).
    let body = agent.wait_for(Duration::from_secs(30), |m| {
        requests(m) >= 36.0 && m.contains("Sensors/T7")
    });
    let s = parse(&body);
    assert_eq!(
        value(&s, "junction_target_up", &[("junction_target", "bmc")]),
        Some(1.0)
    );
    assert_eq!(sessions.created(), 1, "one session for three polls");
    // The BMC ends every session: the next poll creates one new session.
    sessions.expire_all();
    let after = requests(&body);
    let body = agent.wait_for(Duration::from_secs(30), |m| requests(m) >= after + 24.0);
    assert_eq!(
        value(
            &parse(&body),
            "junction_target_up",
            &[("junction_target", "bmc")]
        ),
        Some(1.0)
    );
    assert_eq!(sessions.created(), 2);
    // Sessions that end in the middle of a walk, with four requests in flight: those refused
    // together create one session between them, never one each.
    sessions.expire_after(10);
    let before = sessions.created();
    let after = requests(&body);
    let body = agent.wait_for(Duration::from_secs(30), |m| requests(m) >= after + 60.0);
    assert!(
        sessions.created() >= before + 4,
        "sessions expired and were re-created"
    );
    assert_eq!(sessions.max_live(), 1, "never two sessions at once");
    sessions.expire_after(0);
    // The wrong password: refused at login, an auth failure, no password in the log.
    let s = parse(&body);
    assert_eq!(
        value(&s, "junction_target_up", &[("junction_target", "wrong")]),
        Some(0.0)
    );
    assert!(
        value(
            &s,
            "junction_target_poll_failures_total",
            &[("junction_target", "wrong"), ("error_type", "auth")]
        )
        .is_some_and(|n| n >= 1.0)
    );
    assert!(sessions.refused_logins() >= 1);
    // Shutdown deletes the live session.
    let deleted = sessions.deleted();
    assert!(agent.terminate().success());
    assert_eq!(
        sessions.deleted(),
        deleted + 1,
        "the session is deleted at shutdown"
    );
    assert_eq!(sessions.live(), 0);
    let log = agent.log();
    assert!(
        !log.contains("s3cret-pw") && !log.contains("wrong-pw") && !log.contains("token-"),
        "no secret in the log:\n{log}"
    );
}

/// The same against a Redfish service we did not write: DMTF's Redfish-Mockup-Server answers a
/// session login with 204, `X-Auth-Token` and `Location` (not 201), and removes the session
/// from its collection on DELETE. It does not check tokens; what this shows is that the login
/// and the logout reach it as it expects.
#[test]
fn redfish_sessions_log_in_and_out_of_dmtfs_mockup_server() {
    let Some(server) = bmc::mockup_server(&shared_redfish().join("dmtf-public-cooling-unit"))
    else {
        return;
    };
    let sessions = || {
        let body = support::get(
            server.port,
            "/redfish/v1/SessionService/Sessions",
            Duration::from_secs(10),
        )
        .expect("sessions");
        let doc: Value = serde_json::from_str(&body).expect("sessions JSON");
        doc["Members"]
            .as_array()
            .expect("members")
            .iter()
            .map(|m| m["@odata.id"].as_str().unwrap_or("").to_string())
            .collect::<Vec<_>>()
    };
    let before = sessions();
    let pw = support::temp_dir().join("pw");
    std::fs::write(&pw, "s3cret-pw\n").expect("pw");
    let port = support::free_port();
    let extra = format!(
        "username = \"monitor\"\npassword_file = {:?}\nauth = \"session\"\ninterval_secs = 1",
        pw.display().to_string()
    );
    let sections = redfish_target("cdu", &format!("http://127.0.0.1:{}", server.port), &extra);
    let mut agent = Agent::spawn_config("h100-training.toml", &config(&sections, false, port));
    let body = agent.wait_for(Duration::from_secs(30), |m| {
        value(
            &parse(m),
            "junction_target_requests_total",
            &[("junction_target", "cdu")],
        )
        .is_some_and(|n| n > 40.0)
    });
    assert_eq!(
        value(
            &parse(&body),
            "junction_target_up",
            &[("junction_target", "cdu")]
        ),
        Some(1.0),
        "{}",
        agent.log()
    );
    let during = sessions();
    assert_eq!(
        during.len(),
        before.len() + 1,
        "one session for several polls: {during:?}"
    );
    assert!(agent.terminate().success());
    assert_eq!(sessions(), before, "the session is gone after shutdown");
    assert!(!agent.log().contains("s3cret-pw"));
}

/// The overlap measure the test above relies on: back-to-back connections are one at a time,
/// two held open together are two.
#[test]
fn the_bad_bmcs_overlap_measure_tells_back_to_back_from_overlapping() {
    use std::net::TcpStream;
    let hold = |port: u16| {
        let c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        std::thread::sleep(Duration::from_millis(600));
        c
    };
    let serial = BadBmc::start(None);
    for _ in 0..3 {
        drop(hold(serial.port));
    }
    let parallel = BadBmc::start(None);
    let first = TcpStream::connect(("127.0.0.1", parallel.port)).expect("connect");
    drop(hold(parallel.port));
    drop(first);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(serial.connections(), 3);
    assert_eq!(serial.max_open(Duration::from_millis(250)), 1);
    assert_eq!(parallel.connections(), 2);
    assert_eq!(parallel.max_open(Duration::from_millis(250)), 2);
}
