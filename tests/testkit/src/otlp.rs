//! The OTLP/HTTP receiver of the benchmarks and the demo: a minimal one that counts requests and body
//! bytes per path (and answers 200), so that bytes on the wire per export and per data point
//! can be set beside the bytes of one `/metrics` scrape of the same state.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

/// Requests and body bytes per path.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    pub requests: u64,
    pub bytes: u64,
}

/// A running counting receiver.
pub struct Sink {
    pub port: u16,
    counts: Arc<Mutex<BTreeMap<String, Counts>>>,
}

/// What to do with each request body besides counting it: `(path, gzip, body)`.
pub type Handler = Arc<dyn Fn(&str, bool, &[u8]) + Send + Sync>;

impl Sink {
    /// Listens on a free loopback port.
    pub fn start() -> std::io::Result<Sink> {
        Sink::start_with(None)
    }

    /// Listens on a free loopback port and hands every body to `handler`.
    pub fn start_with(handler: Option<Handler>) -> std::io::Result<Sink> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let counts: Arc<Mutex<BTreeMap<String, Counts>>> = Arc::default();
        let c = counts.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let c = c.clone();
                let h = handler.clone();
                std::thread::spawn(move || {
                    let _ = serve(conn, &c, h.as_ref());
                });
            }
        });
        Ok(Sink { port, counts })
    }

    /// What arrived on `path` so far.
    pub fn counts(&self, path: &str) -> Counts {
        self.counts
            .lock()
            .map(|c| c.get(path).cloned().unwrap_or_default())
            .unwrap_or_default()
    }
}

/// HTTP/1.1 with keep-alive: each request's body is read and counted, then 200.
fn serve(
    conn: std::net::TcpStream,
    counts: &Mutex<BTreeMap<String, Counts>>,
    handler: Option<&Handler>,
) -> std::io::Result<()> {
    let mut out = conn.try_clone()?;
    let mut r = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let path = line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string();
        let mut len = 0usize;
        let mut gzip = false;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h)? == 0 {
                return Ok(());
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse().unwrap_or(0);
            }
            if let Some((k, v)) = h.split_once(':')
                && k.eq_ignore_ascii_case("content-encoding")
            {
                gzip = v.trim().eq_ignore_ascii_case("gzip");
            }
        }
        let mut body = vec![0u8; len];
        r.read_exact(&mut body)?;
        if let Some(h) = handler {
            h(&path, gzip, &body);
        }
        if let Ok(mut c) = counts.lock() {
            let e = c.entry(path).or_default();
            e.requests += 1;
            e.bytes += len as u64;
        }
        out.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
        )?;
    }
}
