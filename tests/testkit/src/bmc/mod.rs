//! BMCs on loopback: `sushy-static` and `sushy-emulator` (PyPI sushy-tools, in the test venv),
//! OpenIPMI's `ipmi_sim`, and two misbehaving HTTP servers (slow, silent).
//!
//! Here the servers' processes and sushy-tools; `bad.rs` the misbehaving servers, `dynamic.rs` a
//! Redfish service whose readings change (and its sessions), `ipmi.rs` `ipmi_sim`.

mod bad;
mod dynamic;
mod ipmi;

pub use bad::BadBmc;
pub use dynamic::{DynamicBmc, Sessions};
pub use ipmi::{IpmiSim, sdr_lines};

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, root, temp_dir};

/// A program from the test venv (`cargo xtask test` installs sushy-tools there); `None`
/// outside CI when it is missing (skips with the reason), a failure in CI.
pub fn venv_tool(name: &str) -> Option<PathBuf> {
    super::require_tool(name, Some(root().join("target/venv/bin").join(name)))
}

/// A server process, killed on drop.
pub struct Server {
    pub child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Runs `cmd` (its stderr to `log`) and waits until it listens on `port` (a TCP connect is
    /// enough: TLS and auth are what the tests test).
    fn start(cmd: &mut Command, port: u16, log: PathBuf) -> Server {
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .unwrap_or_else(|e| panic!("start {:?}: {e}", cmd.get_program()));
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(s)) = child.try_wait() {
                panic!(
                    "server exited ({s}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "server not listening: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Server { child, port, log }
    }
}

/// `sushy-static` serving a short-form tree (`dir/index.json` is the ServiceRoot).
pub fn sushy_static(tool: &Path, dir: &Path) -> Server {
    let port = free_port();
    Server::start(
        Command::new(tool)
            .args(["-i", "127.0.0.1", "-p", &port.to_string(), "-m"])
            .arg(dir),
        port,
        temp_dir().join("sushy-static.log"),
    )
}

/// DMTF's Redfish-Mockup-Server (`cargo xtask test` fetches it into `target/tools`) serving a
/// short-form tree; `None` outside CI when it is missing (skips with the reason).
pub fn mockup_server(dir: &Path) -> Option<Server> {
    let script = super::require_tool(
        "redfishMockupServer.py",
        Some(root().join("target/tools/redfishMockupServer.py")),
    )?;
    let port = free_port();
    Some(Server::start(
        Command::new(root().join("target/venv/bin/python"))
            .arg(&script)
            .args(["-S", "-H", "127.0.0.1", "-p", &port.to_string(), "-D"])
            .arg(dir),
        port,
        temp_dir().join("mockup-server.log"),
    ))
}

/// `sushy-emulator` (fake driver) with basic auth (bcrypt htpasswd) over TLS.
pub fn sushy_emulator(tool: &Path, user: &str, password: &str, cert: &str, key: &str) -> Server {
    let dir = temp_dir();
    let python = root().join("target/venv/bin/python");
    let hash = Command::new(&python)
        .args([
            "-c",
            "import bcrypt,sys; print(bcrypt.hashpw(sys.argv[1].encode(), bcrypt.gensalt(rounds=4)).decode())",
            password,
        ])
        .output()
        .expect("bcrypt");
    assert!(hash.status.success(), "bcrypt: {hash:?}");
    let htpasswd = dir.join("htpasswd");
    std::fs::write(
        &htpasswd,
        format!("{user}:{}\n", String::from_utf8_lossy(&hash.stdout).trim()),
    )
    .expect("htpasswd");
    let (certf, keyf) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&certf, cert).expect("cert");
    std::fs::write(&keyf, key).expect("key");
    let port = free_port();
    let conf = dir.join("emulator.conf");
    std::fs::write(
        &conf,
        format!(
            "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\nSUSHY_EMULATOR_LISTEN_PORT = {port}\nSUSHY_EMULATOR_AUTH_FILE = '{}'\nSUSHY_EMULATOR_SSL_CERT = '{}'\nSUSHY_EMULATOR_SSL_KEY = '{}'\nSUSHY_EMULATOR_FAKE_DRIVER = True\n",
            htpasswd.display(),
            certf.display(),
            keyf.display()
        ),
    )
    .expect("conf");
    Server::start(
        Command::new(tool).arg("--config").arg(&conf).arg("--fake"),
        port,
        dir.join("sushy-emulator.log"),
    )
}
