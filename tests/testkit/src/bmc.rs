//! BMCs on loopback: `sushy-static` and `sushy-emulator` (PyPI sushy-tools, in the test venv),
//! OpenIPMI's `ipmi_sim`, and two misbehaving HTTP servers (slow, silent).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{free_port, free_udp_port, root, temp_dir};

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

/// A BMC that accepts connections and answers after `delay` (never, with `None`); counts
/// connections and the most open at once.
/// A connection's accept time and, once the client closed it, when that was seen.
type Interval = (Instant, Option<Instant>);

pub struct BadBmc {
    pub port: u16,
    /// One per connection.
    intervals: Arc<Mutex<Vec<Interval>>>,
    stop: Arc<AtomicBool>,
}

impl BadBmc {
    pub fn start(delay: Option<Duration>) -> BadBmc {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let intervals = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (iv, s) = (intervals.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let Ok((mut stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let started = Instant::now();
                let index = {
                    let mut v = iv.lock().expect("intervals");
                    v.push((started, None));
                    v.len() - 1
                };
                let (iv, s) = (iv.clone(), s.clone());
                std::thread::spawn(move || {
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(Duration::from_millis(20)));
                    let mut buf = [0u8; 4096];
                    let mut answered = false;
                    // Until the client closes the connection (or the test ends).
                    while !s.load(Ordering::Relaxed) {
                        if let Ok(0) = stream.read(&mut buf) {
                            break;
                        }
                        if let Some(d) = delay
                            && !answered
                            && started.elapsed() >= d
                        {
                            let body = br#"{"@odata.id": "/redfish/v1", "Name": "slow"}"#;
                            let _ = write!(
                                stream,
                                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                                body.len()
                            );
                            let _ = stream.write_all(body);
                            answered = true;
                        }
                    }
                    iv.lock().expect("intervals")[index].1 = Some(Instant::now());
                });
            }
        });
        BadBmc {
            port,
            intervals,
            stop,
        }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.intervals.lock().expect("intervals").len()
    }

    /// The most connections open at one moment. The server sees a close some time after the
    /// client closed (a read timeout, a thread not yet scheduled on a busy machine), so each
    /// connection counts as open until `grace` before the close was seen: a poll that started
    /// right after its predecessor timed out is not an overlap, a poll started while another
    /// was still waiting (for up to its timeout) is.
    pub fn max_open(&self, grace: Duration) -> usize {
        let now = Instant::now();
        let v = self.intervals.lock().expect("intervals").clone();
        (0..v.len())
            .map(|i| {
                let t = v[i].0;
                1 + (0..v.len())
                    .filter(|&j| j != i)
                    .filter(|&j| {
                        let (a, b) = v[j];
                        let end = b.unwrap_or(now + grace);
                        a <= t && end.checked_sub(grace).is_some_and(|e| e > t)
                    })
                    .count()
            })
            .max()
            .unwrap_or(0)
    }
}

impl Drop for BadBmc {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A Redfish service on loopback whose resources a closure computes from the path and the
/// seconds since start (readings that change over time; sushy-static serves only files).
/// With [`DynamicBmc::with_sessions`] it also enforces Redfish session login as DSP0266
/// describes it (no server on PyPI does: sushy-emulator has no SessionService).
pub struct DynamicBmc {
    pub port: u16,
    /// The sessions, when the service requires them.
    pub sessions: Option<Arc<Sessions>>,
    stop: Arc<AtomicBool>,
}

type Resource = dyn Fn(&str, f64) -> Option<serde_json::Value> + Send + Sync;

/// Redfish sessions as a BMC keeps them: `POST /redfish/v1/SessionService/Sessions` with
/// `UserName` and `Password` answers 201 with `X-Auth-Token` and `Location`; every resource but
/// the service root then needs a live token (401 without one); `DELETE` of the session's URI
/// with its token ends it.
#[derive(Default)]
pub struct Sessions {
    user: String,
    password: String,
    state: Mutex<SessionState>,
}

#[derive(Default)]
struct SessionState {
    /// Live tokens and the authenticated requests each has served.
    live: std::collections::BTreeMap<String, u64>,
    created: usize,
    deleted: usize,
    refused_logins: usize,
    max_live: usize,
    /// A session expires after serving this many requests (0: never).
    expire_after: u64,
}

impl Sessions {
    /// Sessions created so far.
    pub fn created(&self) -> usize {
        self.state.lock().expect("sessions").created
    }
    /// Sessions deleted by their client.
    pub fn deleted(&self) -> usize {
        self.state.lock().expect("sessions").deleted
    }
    /// Sessions alive now.
    pub fn live(&self) -> usize {
        self.state.lock().expect("sessions").live.len()
    }
    /// The most sessions alive at once.
    pub fn max_live(&self) -> usize {
        self.state.lock().expect("sessions").max_live
    }
    /// Logins refused (wrong credentials).
    pub fn refused_logins(&self) -> usize {
        self.state.lock().expect("sessions").refused_logins
    }
    /// Ends every session, as a BMC does when they time out or it restarts.
    pub fn expire_all(&self) {
        self.state.lock().expect("sessions").live.clear();
    }
    /// From now on a session ends after serving `n` requests (0: never).
    pub fn expire_after(&self, n: u64) {
        self.state.lock().expect("sessions").expire_after = n;
    }

    /// The status for a request, or `None` to serve it.
    fn check(&self, method: &str, path: &str, token: Option<&str>, body: &str) -> Option<Answer> {
        let mut st = self.state.lock().expect("sessions");
        const COLLECTION: &str = "/redfish/v1/SessionService/Sessions";
        if method == "POST" && path == COLLECTION {
            let creds: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
            if creds["UserName"] != self.user.as_str()
                || creds["Password"] != self.password.as_str()
            {
                st.refused_logins += 1;
                return Some(Answer::status("401 Unauthorized"));
            }
            st.created += 1;
            let token = format!("token-{}", st.created);
            st.live.insert(token.clone(), 0);
            st.max_live = st.max_live.max(st.live.len());
            let id = st.created;
            return Some(Answer {
                status: "201 Created",
                headers: format!("X-Auth-Token: {token}\r\nLocation: {COLLECTION}/{id}\r\n"),
                body: serde_json::json!({"@odata.id": format!("{COLLECTION}/{id}"), "Id": id.to_string(), "UserName": self.user}).to_string(),
            });
        }
        if path == "/redfish/v1" && method == "GET" {
            return None;
        }
        let expire_after = st.expire_after;
        let Some(served) = token.and_then(|t| st.live.get_mut(t)) else {
            return Some(Answer::status("401 Unauthorized"));
        };
        *served += 1;
        if expire_after > 0 && *served > expire_after {
            st.live.remove(token.unwrap_or_default());
            return Some(Answer::status("401 Unauthorized"));
        }
        if method == "DELETE" {
            let own = format!(
                "{COLLECTION}/{}",
                token.unwrap_or("").trim_start_matches("token-")
            );
            if path == own {
                st.live.remove(token.unwrap_or_default());
                st.deleted += 1;
                return Some(Answer::status("204 No Content"));
            }
            return Some(Answer::status("405 Method Not Allowed"));
        }
        None
    }
}

struct Answer {
    status: &'static str,
    headers: String,
    body: String,
}

impl Answer {
    fn status(status: &'static str) -> Answer {
        Answer {
            status,
            headers: String::new(),
            // 204 has no body.
            body: if status.starts_with("204") {
                String::new()
            } else {
                "{}".into()
            },
        }
    }
}

impl DynamicBmc {
    pub fn start(
        resource: impl Fn(&str, f64) -> Option<serde_json::Value> + Send + Sync + 'static,
    ) -> DynamicBmc {
        Self::serve(Arc::new(resource), None)
    }

    /// The same, requiring a session created with `user` and `password`.
    pub fn with_sessions(
        user: &str,
        password: &str,
        resource: impl Fn(&str, f64) -> Option<serde_json::Value> + Send + Sync + 'static,
    ) -> DynamicBmc {
        let sessions = Sessions {
            user: user.into(),
            password: password.into(),
            ..Sessions::default()
        };
        Self::serve(Arc::new(resource), Some(Arc::new(sessions)))
    }

    fn serve(resource: Arc<Resource>, sessions: Option<Arc<Sessions>>) -> DynamicBmc {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let started = Instant::now();
        let sess = sessions.clone();
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let Ok((mut stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let (resource, sessions) = (resource.clone(), sess.clone());
                std::thread::spawn(move || {
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    // One request per connection (HTTP/1.0 style, `Connection: close`).
                    let end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        match stream.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    let header = |name: &str| {
                        head.lines().find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.trim()
                                .eq_ignore_ascii_case(name)
                                .then(|| v.trim().to_string())
                        })
                    };
                    let length: usize = header("Content-Length")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    while buf.len() < end + length {
                        match stream.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body = String::from_utf8_lossy(&buf[end..end + length]).into_owned();
                    let mut words = head.split_whitespace();
                    let method = words.next().unwrap_or("GET").to_string();
                    let path = words.next().unwrap_or("/").to_string();
                    let path = path.split('?').next().unwrap_or("/").trim_end_matches('/');
                    let answer = sessions
                        .as_ref()
                        .and_then(|s| {
                            s.check(&method, path, header("X-Auth-Token").as_deref(), &body)
                        })
                        .unwrap_or_else(|| match resource(path, started.elapsed().as_secs_f64()) {
                            Some(v) => Answer {
                                status: "200 OK",
                                headers: String::new(),
                                body: v.to_string(),
                            },
                            None => Answer::status("404 Not Found"),
                        });
                    let _ = write!(
                        stream,
                        "HTTP/1.1 {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n{}",
                        answer.status,
                        answer.body.len(),
                        answer.headers,
                        answer.body
                    );
                });
            }
        });
        DynamicBmc {
            port,
            sessions,
            stop,
        }
    }
}

impl Drop for DynamicBmc {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

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
