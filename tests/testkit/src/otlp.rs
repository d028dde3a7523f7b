//! The OTLP/HTTP receiver of the tests, the benchmarks and the demo: HTTP/1.1 with
//! keep-alive on loopback, one thread per connection. It counts requests and body bytes per
//! path (the benchmark sets bytes on the wire beside a `/metrics` scrape of the same state),
//! hands each request to a handler (the demo decodes and shows it; the tests decode and keep
//! it) and answers what the handler says: 200, or a scripted failure (503 with `Retry-After`,
//! 400, an answer that comes too late). It can stop listening and come back on the same port
//! (a receiver that restarts), and close connections left idle for a while (as a collector or
//! a load balancer with an idle timeout does). The end-to-end tests add the gRPC side with tonic.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Requests and body bytes per path.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    pub requests: u64,
    pub bytes: u64,
}

/// One request as it arrived.
#[derive(Debug, Clone)]
pub struct Request {
    /// The path (`/v1/metrics`, `/v1/logs`).
    pub path: String,
    /// The headers, names in lower case.
    pub headers: Vec<(String, String)>,
    /// Whether the body is gzip-compressed (`Content-Encoding: gzip`).
    pub gzip: bool,
    /// The body as sent.
    pub body: Vec<u8>,
}

/// What to answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// Extra headers.
    pub headers: Vec<(&'static str, String)>,
    /// Wait this long first (an answer that comes after the client gave up).
    pub delay: Option<Duration>,
    /// The body (a rejection's reason).
    pub body: String,
}

impl Answer {
    /// 200, at once.
    pub fn ok() -> Answer {
        Answer::status(200)
    }

    /// `status`, at once.
    pub fn status(status: u16) -> Answer {
        Answer {
            status,
            headers: Vec::new(),
            delay: None,
            body: String::new(),
        }
    }
}

/// What to do with each request (besides counting it), and what to answer.
pub type Handler = Arc<dyn Fn(&Request) -> Answer + Send + Sync>;

/// A running receiver; stops listening when dropped.
pub struct Sink {
    pub port: u16,
    counts: Arc<Mutex<BTreeMap<String, Counts>>>,
    handler: Option<Handler>,
    stop: Arc<AtomicBool>,
    /// Close a connection idle this long.
    idle_close: Option<Duration>,
}

impl Sink {
    /// Listens on a free loopback port, answering 200 to everything.
    pub fn start() -> std::io::Result<Sink> {
        Sink::start_with(None)
    }

    /// Listens on a free loopback port and hands every request to `handler`.
    pub fn start_with(handler: Option<Handler>) -> std::io::Result<Sink> {
        Sink::start_as(handler, None)
    }

    /// Answers 200 to everything, and closes a connection once it has been idle for `idle`.
    pub fn start_closing_idle(idle: Duration) -> std::io::Result<Sink> {
        Sink::start_as(None, Some(idle))
    }

    fn start_as(handler: Option<Handler>, idle_close: Option<Duration>) -> std::io::Result<Sink> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let mut sink = Sink {
            port: listener.local_addr()?.port(),
            counts: Arc::default(),
            handler,
            stop: Arc::new(AtomicBool::new(false)),
            idle_close,
        };
        sink.serve(listener);
        Ok(sink)
    }

    fn serve(&mut self, listener: TcpListener) {
        let stop = Arc::new(AtomicBool::new(false));
        self.stop = stop.clone();
        let (c, h, idle) = (self.counts.clone(), self.handler.clone(), self.idle_close);
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let (c, h, stop) = (c.clone(), h.clone(), stop.clone());
                std::thread::spawn(move || {
                    let _ = serve(conn, &c, h.as_ref(), &stop, idle);
                });
            }
        });
    }

    /// Stops listening and drops the open connections (the receiver is unreachable).
    pub fn down(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so that it sees the flag and closes the listener.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        std::thread::sleep(Duration::from_millis(100));
    }

    /// Listens again on the same port (retrying briefly while the old socket lets go).
    pub fn up(&mut self) {
        for _ in 0..50 {
            if let Ok(l) = TcpListener::bind(("127.0.0.1", self.port)) {
                self.serve(l);
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("cannot listen on 127.0.0.1:{} again", self.port);
    }

    /// What arrived on `path` so far.
    pub fn counts(&self, path: &str) -> Counts {
        self.counts
            .lock()
            .map(|c| c.get(path).cloned().unwrap_or_default())
            .unwrap_or_default()
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.down();
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

/// HTTP/1.1 with keep-alive: each request is read, counted, handed on and answered.
fn serve(
    conn: TcpStream,
    counts: &Mutex<BTreeMap<String, Counts>>,
    handler: Option<&Handler>,
    stop: &AtomicBool,
    idle_close: Option<Duration>,
) -> std::io::Result<()> {
    // How often an idle connection looks at the stop flag (and its idle time).
    let tick = idle_close.map_or(Duration::from_millis(200), |d| {
        d.min(Duration::from_millis(200)) / 4
    });
    conn.set_read_timeout(Some(tick))?;
    let mut out = conn.try_clone()?;
    let mut r = BufReader::new(conn);
    loop {
        let mut line = String::new();
        let idle_since = std::time::Instant::now();
        // Idle between requests: look at the stop flag now and then; close the connection
        // once it has been idle too long, if told to.
        loop {
            match r.read_line(&mut line) {
                Ok(0) => return Ok(()),
                Ok(_) => break,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    if stop.load(Ordering::SeqCst)
                        || idle_close.is_some_and(|d| idle_since.elapsed() >= d)
                    {
                        return Ok(());
                    }
                }
                Err(e) => return Err(e),
            }
        }
        r.get_ref()
            .set_read_timeout(Some(Duration::from_secs(10)))?;
        let path = line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            if r.read_line(&mut h)? == 0 {
                return Ok(());
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let header = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let len: usize = header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let gzip = header("content-encoding").is_some_and(|v| v.eq_ignore_ascii_case("gzip"));
        let mut body = vec![0u8; len];
        r.read_exact(&mut body)?;
        r.get_ref().set_read_timeout(Some(tick))?;
        if let Ok(mut c) = counts.lock() {
            let e = c.entry(path.clone()).or_default();
            e.requests += 1;
            e.bytes += len as u64;
        }
        let req = Request {
            path,
            headers,
            gzip,
            body,
        };
        let answer = handler.map_or_else(Answer::ok, |h| h(&req));
        if let Some(d) = answer.delay {
            std::thread::sleep(d);
        }
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        let kind = if answer.body.is_empty() {
            "application/x-protobuf"
        } else {
            "text/plain"
        };
        let mut head = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\n",
            answer.status,
            reason(answer.status),
            answer.body.len()
        );
        for (k, v) in &answer.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        head.push_str(&answer.body);
        out.write_all(head.as_bytes())?;
    }
}
