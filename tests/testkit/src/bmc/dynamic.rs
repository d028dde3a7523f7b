//! A Redfish service whose resources a closure computes, with Redfish sessions when asked.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
