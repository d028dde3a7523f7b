//! OpenIPMI's `ipmi_sim` on loopback.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::Server;
use crate::{free_port, free_udp_port, root, temp_dir};

/// OpenIPMI's `ipmi_sim` on a free UDP port, with a console on a free TCP port.
pub struct IpmiSim {
    pub server: Server,
    pub console: u16,
}

/// `main_sdr_add` lines for the SDRs in `sdrs` (sdrcomp syntax), compiled with `sdrcomp -r`.
pub fn sdr_lines(sdrs: &Path) -> String {
    let out = Command::new("sdrcomp")
        .arg("-r")
        .arg(sdrs)
        .output()
        .expect("run sdrcomp");
    assert!(
        out.status.success(),
        "sdrcomp: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let raw = out.stdout;
    let mut lines = String::new();
    let mut i = 0;
    while i + 5 <= raw.len() {
        let n = raw[i + 4] as usize;
        let rec = &raw[i..(i + 5 + n).min(raw.len())];
        lines.push_str("main_sdr_add 0x20");
        for b in rec {
            lines.push_str(&format!(" 0x{b:02x}"));
        }
        lines.push('\n');
        i += 5 + n;
    }
    lines
}

impl IpmiSim {
    /// Starts `ipmi_sim` with the shared `lan.conf` (users admin/password, monitor/monpass)
    /// moved to free ports, and `emu` as its command file.
    pub fn start(emu: &str) -> IpmiSim {
        Self::try_start(emu).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`IpmiSim::start`], or why not.
    pub fn try_start(emu: &str) -> Result<IpmiSim, String> {
        let dir = temp_dir();
        let port = free_udp_port();
        let console = free_port();
        let lan = std::fs::read_to_string(root().join("tests/fixtures/ipmi/lan.conf"))
            .map_err(|e| format!("lan.conf: {e}"))?
            .replace("addr 127.0.0.1 9001", &format!("addr 127.0.0.1 {port}"))
            .replace(
                "console 127.0.0.1 9000",
                &format!("console 127.0.0.1 {console}"),
            );
        let io = |what: &'static str| move |e: std::io::Error| format!("{what}: {e}");
        std::fs::write(dir.join("lan.conf"), lan).map_err(io("lan.conf"))?;
        std::fs::write(dir.join("sim.emu"), emu).map_err(io("sim.emu"))?;
        std::fs::create_dir_all(dir.join("state")).map_err(io("state"))?;
        let log = dir.join("ipmi_sim.log");
        let mut child = Command::new("ipmi_sim")
            .arg("-c")
            .arg(dir.join("lan.conf"))
            .arg("-f")
            .arg(dir.join("sim.emu"))
            .arg("-s")
            .arg(dir.join("state"))
            .arg("-n")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("ipmi_sim.out")).map_err(io("out"))?)
            .stderr(std::fs::File::create(&log).map_err(io("log"))?)
            .spawn()
            .map_err(io("start ipmi_sim"))?;
        // Up when its console shows its prompt (reading it first: a client that connects and
        // leaves at once makes the simulator write to a closed socket and die of SIGPIPE).
        let start = Instant::now();
        loop {
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", console)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let mut got = Vec::new();
                let mut buf = [0u8; 256];
                while !got.ends_with(b"> ") {
                    match s.read(&mut buf) {
                        Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                        _ => break,
                    }
                }
                if got.ends_with(b"> ") {
                    break;
                }
            }
            if let Ok(Some(st)) = child.try_wait() {
                return Err(format!(
                    "ipmi_sim exited ({st}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                ));
            }
            if start.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                let _ = child.wait();
                return Err("ipmi_sim console not answering".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(IpmiSim {
            server: Server { child, port, log },
            console,
        })
    }

    /// Sends one command to the simulator's console and waits for the next prompt (closing
    /// earlier would kill the simulator with SIGPIPE).
    pub fn console(&self, command: &str) {
        let mut s = TcpStream::connect(("127.0.0.1", self.console)).expect("console");
        s.set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        let read_prompt = |s: &mut TcpStream| {
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            let start = Instant::now();
            while !got.ends_with(b"> ") && start.elapsed() < Duration::from_secs(5) {
                if let Ok(n) = s.read(&mut buf) {
                    got.extend_from_slice(&buf[..n]);
                }
            }
            String::from_utf8_lossy(&got).into_owned()
        };
        read_prompt(&mut s);
        s.write_all(format!("{command}\n").as_bytes())
            .expect("write");
        let got = read_prompt(&mut s);
        assert!(!got.contains("rror"), "console: {command}: {got}");
    }
}
